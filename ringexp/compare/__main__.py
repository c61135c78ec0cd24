import sys

from ringexp.compare import main

sys.exit(main())
