"""Ray actor roles. Each class has one role; placement classes (``workers``) compose them."""
