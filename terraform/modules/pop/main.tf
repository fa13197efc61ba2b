# One PoP: its edge nodes, each on its own loopback address 127.0.R.E
# (public, HTTPS with the stack's certificate for edge.local from Consul KV,
# admin, and Envoy's rate limit service over gRPC with the region's rls/
# documents from Consul KV: the ports variable), registered in the region's
# Consul with a /readyz check — and the rate limit service as a service of
# its own (edgeguard-rls) with a gRPC health check. The cloud counterpart is an autoscaling group behind an NLB
# per PoP (see terraform/README.md).

variable "region" {
  type = string
}

variable "pop" {
  type = string
}

variable "edges" {
  description = "The PoP's edges: name and loopback address (the region module numbers them)."
  type = list(object({
    name = string
    addr = string
  }))
}

variable "settings" {
  description = "What every edge of the region shares."
  type = object({
    redis           = string
    redis_mode      = string
    redis_timeout   = string
    consul          = string
    origin          = string
    key_salt        = string
    nodes_in_region = number
    workers         = number
    extra_args      = list(string)
  })
}

variable "ports" {
  description = "Every edge's ports (on its own address)."
  type        = object({ http = number, https = number, admin = number, rls = number })
}

variable "runner" {
  type = object({
    stackctl  = string
    bin_dir   = string
    state_dir = string
  })
}

locals {
  port       = var.ports.http
  tls_port   = var.ports.https
  admin_port = var.ports.admin
  rls_port   = var.ports.rls
  edges      = { for e in var.edges : e.name => e }
  specs = { for e in var.edges : e.name => {
    kind = "edge"
    bin  = var.runner.bin_dir
    edge = {
      name            = e.name
      region          = var.region
      pop             = var.pop
      addr            = e.addr
      port            = local.port
      tls_port        = local.tls_port
      admin_port      = local.admin_port
      rls_port        = local.rls_port
      redis           = var.settings.redis
      redis_mode      = var.settings.redis_mode
      redis_timeout   = var.settings.redis_timeout
      consul          = var.settings.consul
      origin          = var.settings.origin
      key_salt        = var.settings.key_salt
      nodes_in_region = var.settings.nodes_in_region
      nodes_in_pop    = length(var.edges)
      workers         = var.settings.workers
      extra_args      = var.settings.extra_args
    }
  } }
}

module "edge" {
  for_each = local.edges

  source = "../component"
  spec   = local.specs[each.key]
  runner = var.runner
}

output "edges" {
  value = [for e in var.edges : {
    name  = e.name
    addr  = e.addr
    url   = "http://${e.addr}:${local.port}"
    tls   = "${e.addr}:${local.tls_port}"
    admin = "http://${e.addr}:${local.admin_port}"
    rls   = "${e.addr}:${local.rls_port}"
  }]
  depends_on = [module.edge]
}
