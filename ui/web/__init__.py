"""Helpers of meshplan's web app (`ui/streamlit_app.py`): input parsing, cached computations, figures.

Nothing here draws on the page except `cache` (which uses Streamlit's caches); `inputs` and `figures`
are pure and are tested without a browser.
"""
