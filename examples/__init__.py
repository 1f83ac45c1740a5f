"""Example applications on statelog."""
