# The stack's Prometheus (Debian's package): edges discovered through every
# region's Consul (consul_sd_configs, admin port), every redis exporter, a
# 1 s scrape interval, and the remote-write receiver on for k6.

variable "port" {
  type    = number
  default = 9091
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
  type    = number
  default = 9090
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

resource "terraform_data" "prometheus" {
  # A changed spec replaces the component (stop, then start anew):
  # an in-place update would run no provisioner.
  triggers_replace = [jsonencode(local.spec)]
  input = {
    id        = "prometheus"
    spec      = jsonencode(local.spec)
    stackctl  = var.runner.stackctl
    state_dir = var.runner.state_dir
  }

  provisioner "local-exec" {
    command     = "\"$STACKCTL\" up"
    environment = { STACKCTL = self.input.stackctl, STACK_STATE = self.input.state_dir, STACK_SPEC = self.input.spec }
  }

  provisioner "local-exec" {
    when        = destroy
    command     = "\"$STACKCTL\" down \"$ID\""
    environment = { STACKCTL = self.input.stackctl, STACK_STATE = self.input.state_dir, ID = self.input.id }
  }
}

output "url" {
  value = "http://127.0.0.1:${var.port}"
}

output "ready" {
  value = terraform_data.prometheus.id
}
