from jaxtrain.tools.cli import entry_point

entry_point()
