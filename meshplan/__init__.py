"""meshplan's command line: one module per command under `meshplan.commands`.

This package sits on top of the others (estimator <- planner <- launcher); nothing imports it.
"""
