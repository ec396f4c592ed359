"""The Locust wing: the user, the shape, options, web tab, recorder. Importing the user class
(``plugin.user``) attaches the suite to Locust's events, once (``attach``); the scraper and
prepare children import modules of this package without loading Locust."""
