output "regions" {
  description = "Per region: redis (mode, url, seeds, exporters), consul (datacenter, http, dns), origin, pops → edges (name, addr, url, tls, admin, rls), failover."
  value       = { for name, r in module.region : name => r.value }
}

output "prometheus_url" {
  value = module.prometheus.url
}

output "dns_query" {
  description = "The Consul prepared query: <dns_query>.query.consul at a region's Consul DNS."
  value       = "edge"
}

output "rules_file" {
  description = "The rules document pushed with regionctl rules push --all, relative to the repository root."
  value       = "terraform/environments/local/${var.rules_file}"
}

output "tls" {
  description = "The edges' HTTPS: the name their certificate is for (and its subdomains) and the CA that issued it (STATE/tls/ca.pem)."
  value = {
    name    = "edge.local"
    ca_file = "${var.state_dir}/tls/ca.pem"
  }
}

output "state_dir" {
  value = var.state_dir
}
