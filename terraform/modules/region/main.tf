# A region: its Redis, its Consul datacenter, its origin and its PoPs. The
# interface (inputs: name, Redis mode, PoPs → edge counts, failover list,
# origin capacity, key salt; outputs: the contract's per-region object) is
# what a cloud region module would offer too.

variable "name" {
  type = string
}

variable "region_index" {
  type        = number
  description = "Region index from 1 (R in the edges' 127.0.R.E, and the ports)."
}

variable "redis_mode" {
  type = string
}

variable "pops" {
  type        = map(number)
  description = "PoP name → edge count."
  validation {
    condition     = alltrue([for n in values(var.pops) : n >= 1 && n <= 250])
    error_message = "every PoP needs 1..250 edges."
  }
}

variable "failover" {
  type        = list(string)
  description = "Datacenters DNS fails over to, in order."
}

variable "join_wan" {
  type = list(string)
}

variable "key_salt" {
  type      = string
  sensitive = false
}

variable "origin" {
  type = object({
    workers      = number
    service_time = string
    queue        = number
  })
  validation {
    condition     = can(regex("^[1-9][0-9]*ms$", var.origin.service_time))
    error_message = "origin.service_time must be whole milliseconds, e.g. \"20ms\"."
  }
}

variable "redis_timeout" {
  type        = string
  description = "The edges' --redis-timeout; empty keeps the edge's default (250 ms)."
  default     = ""
}

variable "edge_workers" {
  type    = number
  default = 0
}

variable "edge_extra_args" {
  type    = list(string)
  default = []
}

variable "ports" {
  description = "The stack's ports (the environment's ports variable); the region offsets them by its index."
  type = object({
    edge           = object({ http = number, https = number, admin = number, rls = number })
    consul         = object({ http = number, dns = number, server = number, serf_lan = number, serf_wan = number })
    redis          = number
    sentinel       = number
    redis_exporter = number
    origin         = number
    prometheus     = number
    region_stride  = number
  })
}

variable "runner" {
  type = object({
    stackctl  = string
    bin_dir   = string
    state_dir = string
  })
}

locals {
  # Edges are numbered across the region's PoPs in name order: E in 127.0.R.E.
  flat        = flatten([for pop in sort(keys(var.pops)) : [for i in range(var.pops[pop]) : { pop = pop, name = "${var.name}-${pop}-${i + 1}" }]])
  numbered    = [for i, e in local.flat : merge(e, { addr = "127.0.${var.region_index}.${i + 1}" })]
  offset      = (var.region_index - 1) * var.ports.region_stride
  origin_port = var.ports.origin + var.region_index - 1
}

module "redis" {
  source = "../redis"
  region = var.name
  mode   = var.redis_mode
  ports = {
    first    = var.ports.redis + var.region_index * 100 + 1
    sentinel = var.ports.sentinel + local.offset
    exporter = var.ports.redis_exporter + local.offset
  }
  runner = var.runner
}

module "consul" {
  source     = "../consul"
  datacenter = var.name
  ports      = { for k, p in var.ports.consul : k => p + local.offset }
  join_wan   = var.join_wan
  failover   = var.failover
  runner     = var.runner
}

locals {
  origin_spec = {
    kind = "origin"
    bin  = var.runner.bin_dir
    origin = {
      region       = var.name
      port         = local.origin_port
      workers      = var.origin.workers
      service_time = var.origin.service_time
      queue        = var.origin.queue
    }
  }
}

module "origin" {
  source = "../component"
  spec   = local.origin_spec
  runner = var.runner
}

module "pop" {
  source   = "../pop"
  for_each = var.pops

  region = var.name
  pop    = each.key
  edges  = [for e in local.numbered : { name = e.name, addr = e.addr } if e.pop == each.key]
  settings = {
    # Referencing the modules' ready outputs orders the edges after Redis,
    # Consul and the origin.
    redis           = module.redis.ready != "" ? module.redis.url : ""
    redis_mode      = module.redis.mode
    redis_timeout   = var.redis_timeout
    consul          = module.consul.ready != "" ? module.consul.http_addr : ""
    origin          = module.origin.id != "" ? "http://127.0.0.1:${local.origin_port}" : ""
    key_salt        = var.key_salt
    nodes_in_region = length(local.flat)
    workers         = var.edge_workers
    extra_args      = var.edge_extra_args
  }
  ports  = var.ports.edge
  runner = var.runner
}

output "value" {
  description = "The region as the stack's outputs describe it (see the contract in terraform/README.md)."
  value = {
    redis = {
      mode        = module.redis.mode
      url         = module.redis.url
      seeds       = module.redis.seeds
      nodes       = module.redis.nodes
      master_name = module.redis.master_name
      exporters   = module.redis.exporters
    }
    consul = {
      datacenter = module.consul.datacenter
      http       = module.consul.http
      dns        = module.consul.dns
    }
    origin = "http://127.0.0.1:${local.origin_port}"
    # What the origin serves at most (workers / service time): the
    # overload scenario drives a PoP to a multiple of it.
    origin_capacity_rps = floor(var.origin.workers * 1000 / tonumber(trimsuffix(var.origin.service_time, "ms")))
    pops                = { for pop, m in module.pop : pop => { edges = m.edges } }
    failover            = var.failover
    key_salt            = var.key_salt
  }
}

output "consul_http_addr" {
  value = module.consul.http_addr
}

output "exporter_targets" {
  value = module.redis.exporter_targets
}
