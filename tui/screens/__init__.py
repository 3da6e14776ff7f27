"""The viewer's screens: the main screen (tabs and navigation) and its modal dialogs."""
