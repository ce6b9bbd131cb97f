"""The Docker sandbox image: Dockerfile and its offline build (`python -m sandbox.docker.build`)."""
