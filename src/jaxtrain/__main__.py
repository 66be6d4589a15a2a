from jaxtrain.cli import entry_point

entry_point()
