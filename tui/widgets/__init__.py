"""The viewer's widgets: block view, requests pane, overview, charts, one-line text."""
