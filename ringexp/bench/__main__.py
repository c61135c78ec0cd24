from ringexp import entry
from ringexp.bench import main, other_rank

entry.run(main, other_rank)
