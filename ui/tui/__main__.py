"""`python -m ui.tui [--model M --hardware H --nodes N ... --theme light|dark]`: meshplan's terminal UI."""

from meshplan.ui.tui.app import main

main()
