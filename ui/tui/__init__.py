"""meshplan's terminal UI (Textual): `meshplan tui` or `python -m ui.tui`. See ui/tui/app.py."""
