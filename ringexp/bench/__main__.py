from ringexp.bench import main, other_rank
from ringexp.launch import as_rank

as_rank(main, other_rank)
