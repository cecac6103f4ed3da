"""Run configurations: ``get_config()`` in each file returns an ml_collections ConfigDict."""
