"""Several devices: `pj.prepare(..., devices=[...], split={...})` runs one replica of a plan per device (data
parallel), with collectives between the replicas."""
