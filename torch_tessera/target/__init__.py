"""What we run on: device strings and specs, the GPU catalog, prices, green-context partitions, links, the
:class:`~torch_tessera.target.costs.CostTable` / :class:`~torch_tessera.target.costs.Topology` types, the roofline
cost model and the launch profiler.

This package describes the hardware; :mod:`torch_tessera.runtime` executes on it. The scheduler imports this
package, never the runtime.
"""
