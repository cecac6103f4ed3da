"""The TRIP data's side tools: download, Table-1 statistics, the TFDS builder, entities_eval."""
