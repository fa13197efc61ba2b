# One region's Redis: a Cluster (3 masters + 3 replicas) or a Sentinel group
# (master + replica, 3 sentinels), with a prometheus-redis-exporter per node.
# Its ports come from the region (the stack's topology file); the cloud
# counterpart is an ElastiCache replication group (see terraform/README.md).

variable "region" {
  type        = string
  description = "Region name."
}

variable "ports" {
  type = object({
    first    = number
    sentinel = number
    exporter = number
  })
  description = "The first data node's, sentinel's and exporter's port; the others follow."
}

variable "mode" {
  type        = string
  description = "cluster or sentinel."
  validation {
    condition     = contains(["cluster", "sentinel"], var.mode)
    error_message = "mode must be cluster or sentinel."
  }
}

variable "runner" {
  type = object({
    stackctl  = string
    bin_dir   = string
    state_dir = string
  })
  description = "The stackctl binary, the directory of the stack's binaries and the state directory."
}

locals {
  ports          = [for i in range(var.mode == "cluster" ? 6 : 2) : var.ports.first + i]
  sentinel_ports = var.mode == "sentinel" ? [for i in range(3) : var.ports.sentinel + i] : []
  exporter_ports = [for i in range(length(local.ports)) : var.ports.exporter + i]
  master_name    = "${var.region}-master"
  seeds          = [for p in(var.mode == "cluster" ? local.ports : local.sentinel_ports) : "127.0.0.1:${p}"]
  url = var.mode == "cluster" ? (
    "redis://${local.seeds[0]}?${join("&", [for s in slice(local.seeds, 1, length(local.seeds)) : "addr=${s}"])}"
    ) : (
    "redis://${local.seeds[0]}?${join("&", [for s in slice(local.seeds, 1, length(local.seeds)) : "addr=${s}"])}&master_name=${local.master_name}"
  )
  spec = {
    kind = "redis"
    bin  = var.runner.bin_dir
    redis = {
      region         = var.region
      mode           = var.mode
      ports          = local.ports
      sentinel_ports = local.sentinel_ports
      master_name    = var.mode == "sentinel" ? local.master_name : ""
      exporter_ports = local.exporter_ports
    }
  }
}

module "process" {
  source = "../component"
  spec   = local.spec
  runner = var.runner
}

output "mode" {
  value = var.mode
}

output "url" {
  description = "go-redis URL: cluster seeds, or sentinels with master_name."
  value       = local.url
}

output "seeds" {
  description = "Cluster nodes, or the sentinels."
  value       = local.seeds
}

output "nodes" {
  description = "Every data node (the ones a drill may kill)."
  value       = [for p in local.ports : "127.0.0.1:${p}"]
}

output "exporters" {
  value = [for p in local.exporter_ports : "http://127.0.0.1:${p}/metrics"]
}

output "exporter_targets" {
  value = [for p in local.exporter_ports : "127.0.0.1:${p}"]
}

output "master_name" {
  value = var.mode == "sentinel" ? local.master_name : ""
}

output "ready" {
  description = "Depends on the running deployment."
  value       = module.process.id
}
