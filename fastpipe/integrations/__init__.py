"""fastpipe where training already runs: Lightning and the Hugging Face Trainer.

Each integration is its own module, importing its framework only when used (``pip install
'fastpipe[lightning]'``, ``'fastpipe[hf]'``): a callback that runs :func:`fastpipe.watch`'s monitor inside the
framework's fit loop, and ``diagnose`` that runs the cache ladder on the framework's own training step,
optimizer, scheduler and precision. They sit above ``diagnosis`` and ``monitor`` and below the CLI.
"""
