import sys

from ringexp import conffiles
from ringexp.bench import main, other_rank
from ringexp.errors import ConfigError, print_error
from ringexp.launch import as_rank

try:
    with conffiles.gate():  # every option file Hydra composes, checked as it reads it (ringexp.conffiles)
        as_rank(main, other_rank)
except ConfigError as e:
    print_error(str(e))
    sys.exit(2)
