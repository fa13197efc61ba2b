# The stack's topology — regions, PoPs, edge counts and every port — is
# topology.auto.tfvars.json, which Terraform loads by itself and which the
# load-test fixture (loadtest/fixture.sh) reads too: nothing here repeats it.
# Its us-east origin is capacity-limited (8 workers × 20 ms = 400 req/s) so
# that taking eu-west's traffic overloads it (drill 2).

variable "regions" {
  description = <<-EOT
    Regions to run: name → Redis mode (cluster | sentinel), PoPs (name → edge
    count), the datacenters DNS fails over to (explicit, in order), the
    origin's capacity (workers × service time), and optionally the edges'
    worker cap, extra edge flags and the region's key salt.
  EOT
  type = map(object({
    redis_mode = string
    pops       = map(number)
    failover   = list(string)
    origin = optional(object({
      workers      = number
      service_time = string
      queue        = number
    }), { workers = 64, service_time = "2ms", queue = 1024 })
    redis_timeout   = optional(string, "")
    edge_workers    = optional(number, 0)
    edge_extra_args = optional(list(string), [])
    key_salt        = optional(string)
  }))
  validation {
    condition     = length(var.regions) >= 1 && length(var.regions) <= 9
    error_message = "between 1 and 9 regions (the region index picks ports)."
  }
  validation {
    condition     = alltrue([for r in values(var.regions) : contains(["cluster", "sentinel"], r.redis_mode)])
    error_message = "redis_mode must be cluster or sentinel."
  }
  validation {
    condition     = alltrue([for r in values(var.regions) : r.key_salt == null ? true : length(r.key_salt) >= 16])
    error_message = "a key_salt must be at least 16 characters (the edge refuses shorter ones)."
  }
  validation {
    condition     = alltrue([for r in values(var.regions) : alltrue([for dc in r.failover : contains(keys(var.regions), dc)])])
    error_message = "every failover datacenter must be one of the regions."
  }
}

variable "ports" {
  description = <<-EOT
    The stack's ports. Every edge has its own address 127.0.R.E (R: the
    region's index from 1, in name order) and listens on the edge ports. Per
    region R: Redis nodes redis + 100·R + 1…, sentinels, exporters and the
    Consul ports at their base + region_stride·(R−1), the origin at
    origin + R − 1; one Prometheus.
  EOT
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

variable "state_dir" {
  type        = string
  description = "Absolute path of the stack's state directory (pids, ports, logs)."
}

variable "bin_dir" {
  type        = string
  description = "Absolute path of the directory holding edge, regionctl, stackctl and stackorigin."
}

variable "rules_file" {
  type        = string
  description = "Rules document pushed to every region, relative to this directory."
  default     = "rules.yaml"
}

variable "key_salt" {
  type        = string
  description = "The edges' key salt, one for every region: a global rule's key, and so its home region, must be the same everywhere (a region's own key_salt overrides it)."
  default     = "edgeguard-stack-key-salt"
  validation {
    condition     = length(var.key_salt) >= 16
    error_message = "key_salt must be at least 16 characters (the edge refuses shorter ones)."
  }
}
