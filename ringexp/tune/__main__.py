import sys

from ringexp.tune.cli import main

sys.exit(main())
