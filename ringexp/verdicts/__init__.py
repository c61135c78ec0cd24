"""Runs judged against a baseline, for the commands that judge (compare and the tune; plan reads the quality.json
they write through ringexp.quality): below the commands, above ringexp.predict, whose task differences it reads.

    load     the runs: local run directories or a W&B group, each summary checked against ringexp.summary
    members  which runs a seed group holds (the baseline's task and code versions, one per seed), and why the others not
    groups   seed groups, their quality verdicts (ringexp.quality) and time to target; groups.csv and quality.json
    cells    how a value is written as a table's cell
"""
