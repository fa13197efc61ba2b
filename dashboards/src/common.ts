// Shared conventions of every edgeguard board: the datasource and
// region/pop/instance variables, label selectors, and panel helpers that
// always set a unit, thresholds and a description (what the panel means
// and what to do about it).
import * as cog from '@grafana/grafana-foundation-sdk/cog';
import * as common from '@grafana/grafana-foundation-sdk/common';
import * as dashboard from '@grafana/grafana-foundation-sdk/dashboard';
import * as prometheus from '@grafana/grafana-foundation-sdk/prometheus';
import * as stat from '@grafana/grafana-foundation-sdk/stat';
import * as table from '@grafana/grafana-foundation-sdk/table';
import * as timeseries from '@grafana/grafana-foundation-sdk/timeseries';

export const datasource: common.DataSourceRef = { type: 'prometheus', uid: '${datasource}' };

// Every edge series carries region and pop (constant labels of the edge's
// registry) and instance (added by Prometheus).
export const sel = 'region=~"$region", pop=~"$pop", instance=~"$instance"';
// Redis exporter series carry region when the scrape config attaches it
// (the stack's and the checks' Prometheus do).
export const redisSel = 'region=~"$region"';

// A label-value variable; "All" matches every value, missing labels too.
function labelVariable(name: string, label: string, query: string, description: string): cog.Builder<dashboard.VariableModel> {
  return new dashboard.QueryVariableBuilder(name)
    .label(label)
    .description(description)
    .datasource(datasource)
    .query({ qryType: 1, query, refId: 'PrometheusVariableQueryEditor-VariableQuery' })
    .definition(query)
    .refresh(dashboard.VariableRefresh.OnTimeRangeChanged)
    .sort(dashboard.VariableSort.AlphabeticalAsc)
    .multi(true)
    .includeAll(true)
    .allValue('.*')
    .current({ text: 'All', value: '$__all' });
}

export function variables(): cog.Builder<dashboard.VariableModel>[] {
  return [
    new dashboard.DatasourceVariableBuilder('datasource').label('Data source').type('prometheus'),
    labelVariable('region', 'Region', 'label_values(edgeguard_edge_ready, region)', 'Regions: one Redis deployment and one Consul datacenter each.'),
    labelVariable('pop', 'PoP', 'label_values(edgeguard_edge_ready{region=~"$region"}, pop)', 'Points of presence in the selected regions.'),
    labelVariable('instance', 'Edge', 'label_values(edgeguard_edge_ready{region=~"$region", pop=~"$pop"}, instance)', 'Edge nodes (their admin address) in the selected PoPs.'),
  ];
}

// Push marks on every board: when the edges of a region loaded new rules or
// a new enforcement switch (regionctl rules push / enforcement set, or a
// rollback). The load time (in ms) is the mark's time, so it sits where the
// change took effect, not at the next evaluation step.
function pushAnnotation(name: string, color: string, expr: string, title: string, text: string, tags: string): dashboard.AnnotationQueryBuilder {
  return new dashboard.AnnotationQueryBuilder()
    .name(name)
    .datasource(datasource)
    .enable(true)
    .iconColor(color)
    .target(new prometheus.DataqueryBuilder().refId('Anno').expr(expr))
    .expr(expr)
    .useValueForTime(true)
    .titleFormat(title)
    .textFormat(text)
    .tagKeys(tags)
    .step('15s');
}

export function pushAnnotations(): dashboard.AnnotationQueryBuilder[] {
  return [
    pushAnnotation('Rules push', 'blue',
      `max by (region, version) (edgeguard_edge_rules_loaded_timestamp_seconds{${sel}} * on (instance, job) group_left (version) edgeguard_edge_rules_info{${sel}}) * 1000`,
      'rules {{version}}', '{{region}} loaded rules version {{version}} (regionctl rules history --region {{region}})', 'region,version'),
    pushAnnotation('Enforcement switch', 'orange',
      `max by (region, mode, version) (edgeguard_edge_enforcement_loaded_timestamp_seconds{${sel}} * on (instance, job) group_left (mode, version) edgeguard_edge_enforcement_info{${sel}}) * 1000`,
      'enforcement {{mode}} {{version}}', '{{region}} switched enforcement to {{mode}}, version {{version}} (regionctl enforcement get --region {{region}})', 'region,mode,version'),
  ];
}

export function board(uid: string, title: string, description: string, tags: string[]): dashboard.DashboardBuilder {
  const b = new dashboard.DashboardBuilder(title)
    .uid(uid)
    .description(description)
    .tags(['edgeguard', ...tags])
    .editable()
    .tooltip(dashboard.DashboardCursorSync.Crosshair)
    .refresh('30s')
    .time({ from: 'now-1h', to: 'now' })
    .timezone('browser')
    .variables(variables())
    .link(new dashboard.DashboardLinkBuilder('edgeguard').type(dashboard.DashboardLinkType.Dashboards).tags(['edgeguard']).asDropdown(true).includeVars(true).keepTime(true));
  for (const a of pushAnnotations()) b.annotation(a);
  return b;
}

export interface Target {
  expr: string;
  legend: string;
  instant?: boolean;
}

export interface Step {
  value: number | null;
  color: string;
}

export interface PanelSpec {
  title: string;
  // What the panel shows, then what to do when it looks wrong.
  description: string;
  unit: string;
  // Threshold steps; the first one's value is null (the base colour).
  thresholds: Step[];
  targets: Target[];
  width?: number;
  height?: number;
  min?: number;
  max?: number;
  mappings?: dashboard.ValueMapping[];
}

function thresholdsOf(steps: Step[]): dashboard.ThresholdsConfigBuilder {
  return new dashboard.ThresholdsConfigBuilder().mode(dashboard.ThresholdsMode.Absolute).steps(steps);
}

function queries(spec: PanelSpec): prometheus.DataqueryBuilder[] {
  return spec.targets.map((t, i) => {
    const q = new prometheus.DataqueryBuilder()
      .datasource(datasource)
      .refId(String.fromCharCode(65 + i))
      .expr(t.expr)
      .legendFormat(t.legend);
    return t.instant ? q.instant().format(prometheus.PromQueryFormat.Table) : q.range();
  });
}

export function timeSeries(spec: PanelSpec): timeseries.PanelBuilder {
  const p = new timeseries.PanelBuilder()
    .title(spec.title)
    .description(spec.description)
    .datasource(datasource)
    .unit(spec.unit)
    .thresholds(thresholdsOf(spec.thresholds))
    .thresholdsStyle(new common.GraphThresholdsStyleConfigBuilder().mode(common.GraphThresholdsStyleMode.Dashed))
    .targets(queries(spec))
    .legend(new common.VizLegendOptionsBuilder().displayMode(common.LegendDisplayMode.Table).placement(common.LegendPlacement.Bottom).showLegend(true).calcs(['lastNotNull', 'max']))
    .tooltip(new common.VizTooltipOptionsBuilder().mode(common.TooltipDisplayMode.Multi).sort(common.SortOrder.Descending))
    .height(spec.height ?? 8)
    .span(spec.width ?? 12);
  if (spec.min !== undefined) p.min(spec.min);
  if (spec.max !== undefined) p.max(spec.max);
  if (spec.mappings) p.mappings(spec.mappings);
  return p;
}

export function statPanel(spec: PanelSpec): stat.PanelBuilder {
  const p = new stat.PanelBuilder()
    .title(spec.title)
    .description(spec.description)
    .datasource(datasource)
    .unit(spec.unit)
    .thresholds(thresholdsOf(spec.thresholds))
    .targets(queries(spec))
    .colorMode(common.BigValueColorMode.Background)
    .graphMode(common.BigValueGraphMode.Area)
    .reduceOptions(new common.ReduceDataOptionsBuilder().calcs(['lastNotNull']).values(false))
    .height(spec.height ?? 6)
    .span(spec.width ?? 6);
  if (spec.min !== undefined) p.min(spec.min);
  if (spec.max !== undefined) p.max(spec.max);
  if (spec.mappings) p.mappings(spec.mappings);
  return p;
}

export function tablePanel(spec: PanelSpec): table.PanelBuilder {
  const p = new table.PanelBuilder()
    .title(spec.title)
    .description(spec.description)
    .datasource(datasource)
    .unit(spec.unit)
    .thresholds(thresholdsOf(spec.thresholds))
    .targets(queries(spec))
    .withTransformation({ id: 'organize', options: { excludeByName: { Time: true } } })
    .height(spec.height ?? 8)
    .span(spec.width ?? 12);
  if (spec.mappings) p.mappings(spec.mappings);
  return p;
}

export function row(title: string): dashboard.RowBuilder {
  return new dashboard.RowBuilder(title);
}

// Value-to-text mappings for small enumerations.
export function valueMap(entries: Record<string, { text: string; color: string }>): dashboard.ValueMapping[] {
  const options: Record<string, dashboard.ValueMappingResult> = {};
  let i = 0;
  for (const [k, v] of Object.entries(entries)) {
    options[k] = { ...v, index: i++ };
  }
  return [{ type: dashboard.MappingType.ValueToText, options }];
}

export const green = (value: number | null = null): Step => ({ value, color: 'green' });
export const orange = (value: number): Step => ({ value, color: 'orange' });
export const red = (value: number | null = null): Step => ({ value, color: 'red' });
export const blue = (value: number | null = null): Step => ({ value, color: 'blue' });

// Rates over Grafana's rate interval (at least four scrapes).
export const rate = (metric: string, extra = ''): string => `rate(${metric}{${sel}${extra ? ', ' + extra : ''}}[$__rate_interval])`;
