def cached_conversion(path): raise NotImplementedError
