# One region's Consul datacenter: a single server keeping its data in the
# state directory, WAN-joined to the other regions (retried, so a restarted
# server rejoins by itself), with the prepared query that routes DNS to the
# region's healthy edges and fails over along an explicit datacenter list.

variable "datacenter" {
  type        = string
  description = "Datacenter name (the region's)."
}

variable "ports" {
  type = object({
    http     = number
    dns      = number
    server   = number
    serf_lan = number
    serf_wan = number
  })
}

variable "join_wan" {
  type        = list(string)
  description = "Serf WAN addresses of the other datacenters."
  default     = []
}

variable "failover" {
  type        = list(string)
  description = "Datacenters the prepared query fails over to, in order, when the region has no healthy edge."
  default     = []
}

variable "query" {
  type    = string
  default = "edge"
}

variable "service" {
  type    = string
  default = "edgeguard-edge"
}

variable "runner" {
  type = object({
    stackctl  = string
    bin_dir   = string
    state_dir = string
  })
}

locals {
  ports = var.ports
  spec = {
    kind = "consul"
    bin  = var.runner.bin_dir
    consul = merge(local.ports, {
      datacenter = var.datacenter
      join_wan   = var.join_wan
      failover   = var.failover
      query      = var.query
      service    = var.service
    })
  }
}

module "process" {
  source = "../component"
  spec   = local.spec
  runner = var.runner
}

output "datacenter" {
  value = var.datacenter
}

output "http" {
  value = "http://127.0.0.1:${local.ports.http}"
}

output "http_addr" {
  value = "127.0.0.1:${local.ports.http}"
}

output "dns" {
  value = "127.0.0.1:${local.ports.dns}"
}

output "serf_wan" {
  value = "127.0.0.1:${local.ports.serf_wan}"
}

output "ready" {
  value = module.process.id
}
