"""Data files packaged with kvpack (the centering probe text)."""
