from ringexp import dist as rdist
from ringexp import entry
from ringexp.bench import main, other_rank

rdist.end(lambda: entry.run(main, other_rank))
