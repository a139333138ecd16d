"""The poissonmark service: key store (Redis), settings, auth, HTTP routes."""
