from ringexp import dist as rdist
from ringexp.plan.cli import main

rdist.end(main)
