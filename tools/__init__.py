"""Command-line tools and Spark jobs over a statelog job root."""
