"""Token Recycling Studio, the app's parts: settings, sessions, the model catalogue, handlers and the page.

`app.py` parses arguments and launches; `page.build_demo` lays out the page; `handlers` holds the functions
of (session, inputs) that return what to show; `session` the per-visitor state; `models` the shared models.
"""
