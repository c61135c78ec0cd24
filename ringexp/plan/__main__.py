from ringexp.plan.cli import main

main()
