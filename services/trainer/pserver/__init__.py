"""The parameter server (`tideshift run pserver`): holds one range of the model's pieces,
applies each (epoch, shard, batch) exactly once and checkpoints. service.py is the process
and its request handlers; store.py is what it keeps on the bus (checkpoint, progress record)
and what `tideshift training reset` forgets.
"""
