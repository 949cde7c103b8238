"""bloomline core: contracts shared by every stage (config loading, language registry, file I/O)."""

__version__ = "0.1.0"
