# The stack's Prometheus (Debian's package): edges discovered through every
# region's Consul (consul_sd_configs, admin port), every redis exporter, a
# 1 s scrape interval, and the remote-write receiver on for k6.

variable "port" {
  type = number
}

variable "scrape_interval" {
  type    = string
  default = "1s"
}

variable "consuls" {
  type        = map(string)
  description = "Datacenter → Consul HTTP host:port."
}

variable "exporters" {
  type        = map(list(string))
  description = "Region → redis exporter host:port list."
}

variable "service" {
  type    = string
  default = "edgeguard-edge"
}

variable "edge_admin_port" {
  type = number
}

variable "runner" {
  type = object({
    stackctl  = string
    bin_dir   = string
    state_dir = string
  })
}

locals {
  spec = {
    kind = "prometheus"
    bin  = var.runner.bin_dir
    prometheus = {
      port            = var.port
      scrape_interval = var.scrape_interval
      consuls         = var.consuls
      exporters       = var.exporters
      service         = var.service
      admin_port      = var.edge_admin_port
    }
  }
}

module "process" {
  source = "../component"
  spec   = local.spec
  runner = var.runner
}

output "url" {
  value = "http://127.0.0.1:${var.port}"
}

output "ready" {
  value = module.process.id
}
