from autosched.cli import main

main()
