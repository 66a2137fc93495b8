ALIASES = {}
def ensure(name): raise NotImplementedError
