"""The generated messages and stubs of sandhold.v1 (proto/sandhold/v1)."""
