"""The remedies :func:`fastpipe.diagnosis.verdict._advice.recommend` chooses from, one concern a module.

``_pipeline`` reads the user's pipeline by the transform catalog's facts (never a class name); ``_transforms`` words
one transform's remedy; ``_decode`` decoding only the crop; ``_batches`` collate, the copy, workers and a
ThreadLoader's own stages; ``_stream`` streams and WebDataset shards; ``_probes`` file headers (image sizes,
progressive JPEGs); ``_snippets`` the code printed; ``_base`` the :class:`Advice` type and the stage kinds. Nothing
is imported here, so that each module imports only what it uses.
"""
