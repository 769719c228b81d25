"""Project-wide settings, as `scrapy startproject` would leave them.

Everything scrapy-retryafter needs is in the store spider's custom_settings,
so the spider can be copied into another project as it is.
"""

BOT_NAME = "shop"

SPIDER_MODULES = ["shop.spiders"]
NEWSPIDER_MODULE = "shop.spiders"

ROBOTSTXT_OBEY = True
LOG_LEVEL = "INFO"  # DEBUG prints every item
TELNETCONSOLE_ENABLED = False
FEED_EXPORT_ENCODING = "utf-8"
TWISTED_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
