"""`python -m towerlib.launch --workers N -- COMMAND ...` (see towerlib.launch.command_line)."""

from towerlib.launch.command_line import main

if __name__ == "__main__":
    main()
