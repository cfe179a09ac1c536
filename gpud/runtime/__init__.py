"""One DeviceRuntime per GPU: flush policy, completion ledger, staging pools, caches, submit worker."""
