"""One module per encoder family (``trip_jax.models.contract.Family``); the list: ``registry``."""
