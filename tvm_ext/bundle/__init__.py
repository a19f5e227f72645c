"""Build here, time there: measurement bundles for a device that has only TVM's runtime."""
