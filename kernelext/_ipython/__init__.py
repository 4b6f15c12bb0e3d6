"""The IPython extension: ``%load_ext kernelext`` (magics, options, interrupt handling).

Loaded through :func:`kernelext.load_ipython_extension`; see :mod:`.extension`.
"""
