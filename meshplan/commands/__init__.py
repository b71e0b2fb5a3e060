"""One module per `meshplan` command."""
