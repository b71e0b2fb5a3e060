"""The web app's views, one module each with `render(ctx)`; ui/streamlit_app.py draws the sidebar, the chosen
plan's metrics and the tabs, then renders the open view."""
