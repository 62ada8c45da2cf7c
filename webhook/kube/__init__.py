"""The Kubernetes API as the service uses it: one REST client with one set of errors
(``client``), the resources it reads and writes (``resources``), list+watch caches
(``watch``), the cluster state fed from them (``state``) and bounded calls for the event loop
(``calls``). Nothing here knows about policies beyond :class:`~policies.k8s.clusterstate.ClusterState`."""
