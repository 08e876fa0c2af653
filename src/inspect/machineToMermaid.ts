// Draws an XState machine from its own definition (machine.root), so the chart can never
// drift from the code: states, initial states, transitions with their events and guards,
// handlers that act in place, entry/exit actions, invoked actors and final states. Two forms:
// a JSON chart (for programs and the live page) and Mermaid stateDiagram-v2 text made from it.
// No package does this for xstate v5 (@statelyai/inspect only feeds the hosted inspector).
import type { AnyStateMachine, AnyStateNode } from 'xstate';

export type ChartStateType = 'atomic' | 'compound' | 'parallel' | 'final' | 'history';

export interface ChartState {
  /** xstate's id, e.g. "supervisor.loading". */
  id: string;
  key: string;
  /** Keys from the root; joined with "." this is the state value a snapshot reports. */
  path: string[];
  /** The node's id in the Mermaid text, and so in the SVG mermaid draws from it. */
  mermaidId: string;
  type: ChartStateType;
  /** Id of the initial child (compound states). */
  initial?: string;
  entry: string[];
  exit: string[];
  invoke: Array<{ id: string; src: string }>;
  states: ChartState[];
}

export type ChartTransitionKind = 'event' | 'always' | 'after' | 'done' | 'error';

export interface ChartTransition {
  /** Id of the state that handles the event. */
  source: string;
  /** The event type as xstate names it; empty for eventless ("always") transitions. */
  event: string;
  kind: ChartTransitionKind;
  /** What the chart shows: the event, "after stopTimeout", "prepareNode done", "always". */
  label: string;
  /** Ids of the target states; empty when the state handles the event in place. */
  targets: string[];
  guard?: string;
  actions: string[];
  /** The delay's name or milliseconds (kind "after"). */
  delay?: string | number;
}

export interface MachineChart {
  id: string;
  /** Id of the root's initial state. */
  initial?: string;
  states: ChartState[];
  transitions: ChartTransition[];
}

// Words the stateDiagram grammar reads as keywords when used as a bare state id.
const MERMAID_KEYWORDS = new Set(['state', 'note', 'end', 'class', 'classDef', 'style', 'direction', 'as']);

/** The Mermaid id of a state: its path, with characters the grammar rejects replaced. */
export function mermaidStateId(path: readonly string[]): string {
  const id = path.join('__').replace(/[^A-Za-z0-9_]/g, '_');
  return MERMAID_KEYWORDS.has(id) ? `state_${id}` : id;
}

/** The name of an action, guard or actor as written in setup(), or what xstate calls it. */
function implementationName(impl: unknown): string {
  if (typeof impl === 'string') return impl;
  if (typeof impl === 'function') {
    // and()/or()/not() guards are functions carrying the guards they combine.
    const parts = (impl as { guards?: unknown[] }).guards;
    if (Array.isArray(parts) && ['and', 'or', 'not'].includes(impl.name)) {
      const names = parts.map(implementationName);
      return impl.name === 'not' ? `!${names[0]}` : `(${names.join(impl.name === 'and' ? ' && ' : ' || ')})`;
    }
    const type = (impl as { type?: unknown }).type;
    return typeof type === 'string' ? type : impl.name || 'inline';
  }
  if (impl && typeof impl === 'object') {
    const type = (impl as { type?: unknown }).type;
    if (typeof type === 'string') return type;
    const id = (impl as { id?: unknown }).id;
    if (typeof id === 'string') return id;
  }
  return 'inline';
}

/** User-visible actions: xstate's own (the timers behind `after`, for one) are left out. */
function actionNames(actions: readonly unknown[] | undefined): string[] {
  return (actions ?? []).map(implementationName).filter((n) => !n.startsWith('xstate.'));
}

interface TransitionLike {
  target?: readonly AnyStateNode[];
  actions: readonly unknown[];
  guard?: unknown;
  eventType: string;
}

function describeTransition(node: AnyStateNode, t: TransitionLike, always: boolean): ChartTransition {
  const invokes = new Map(node.invoke.map((i) => [i.id, implementationName(i.src)]));
  const delays = new Map(node.after.map((a) => [a.eventType, a.delay]));
  let kind: ChartTransitionKind = 'event';
  let label = t.eventType;
  let delay: string | number | undefined;
  const invokeEvent = /^xstate\.(done|error)\.actor\.(.+)$/.exec(t.eventType);
  if (always) {
    kind = 'always';
    label = 'always';
  } else if (delays.has(t.eventType)) {
    kind = 'after';
    const d = delays.get(t.eventType);
    delay = typeof d === 'number' || typeof d === 'string' ? d : implementationName(d);
    label = `after ${typeof delay === 'number' ? `${delay} ms` : delay}`;
  } else if (invokeEvent && invokes.has(invokeEvent[2]!)) {
    kind = invokeEvent[1] as 'done' | 'error';
    label = `${invokes.get(invokeEvent[2]!)} ${kind}`;
  }
  const guard = t.guard === undefined ? undefined : implementationName(t.guard);
  return {
    source: node.id,
    event: always ? '' : t.eventType,
    kind,
    label,
    targets: (t.target ?? []).map((s) => s.id),
    ...(guard === undefined ? {} : { guard }),
    actions: actionNames(t.actions),
    ...(delay === undefined ? {} : { delay }),
  };
}

function describeState(node: AnyStateNode, transitions: ChartTransition[]): ChartState {
  // Children first: the layout follows the order of the edges, and a parent's transitions
  // (the root's catch-all failure above all) should not come before the main flow.
  const children = Object.values(node.states as Record<string, AnyStateNode>).map((child) => describeState(child, transitions));
  for (const list of node.transitions.values()) {
    for (const t of list) transitions.push(describeTransition(node, t as TransitionLike, false));
  }
  for (const t of node.always ?? []) transitions.push(describeTransition(node, t as TransitionLike, true));
  const initial = node.type === 'compound' ? node.initial.target[0]?.id : undefined;
  return {
    id: node.id,
    key: node.key,
    path: node.path,
    mermaidId: mermaidStateId(node.path),
    type: node.type,
    ...(initial === undefined ? {} : { initial }),
    entry: actionNames(node.entry),
    exit: actionNames(node.exit),
    invoke: node.invoke.map((i) => ({ id: i.id, src: implementationName(i.src) })),
    states: children,
  };
}

/** The JSON chart of a machine. */
export function machineToChart(machine: AnyStateMachine): MachineChart {
  const transitions: ChartTransition[] = [];
  const root = describeState(machine.root, transitions);
  return { id: root.id, ...(root.initial === undefined ? {} : { initial: root.initial }), states: root.states, transitions };
}

/** Every state of the chart, parents before children. */
export function chartStates(chart: Pick<MachineChart, 'states'>): ChartState[] {
  return chart.states.flatMap((s) => [s, ...chartStates(s)]);
}

/** Edge labels and descriptions are free text up to the line's end; these would end them early. */
function mermaidText(s: string): string {
  return s.replace(/[;#\r\n{}]/g, ' ');
}

function transitionText(t: ChartTransition): string {
  return t.guard === undefined ? t.label : `${t.label} [${t.guard}]`;
}

/** Mermaid stateDiagram-v2 text of a chart. */
export function chartToMermaid(chart: MachineChart): string {
  const byId = new Map(chartStates(chart).map((s) => [s.id, s]));
  const lines = ['stateDiagram-v2'];

  const declare = (states: ChartState[], initial: string | undefined, indent: string, regions: boolean): void => {
    if (initial !== undefined) lines.push(`${indent}[*] --> ${byId.get(initial)!.mermaidId}`);
    states.forEach((s, i) => {
      if (regions && i > 0) lines.push(`${indent}--`);
      if (s.states.length > 0) {
        lines.push(`${indent}state "${mermaidText(s.key)}" as ${s.mermaidId} {`);
        declare(s.states, s.initial, `${indent}  `, s.type === 'parallel');
        lines.push(`${indent}}`);
        return;
      }
      const inPlace = chart.transitions.filter((t) => t.source === s.id && t.targets.length === 0);
      const notes = [
        ...(s.entry.length > 0 ? [`entry / ${s.entry.join(', ')}`] : []),
        ...s.invoke.map((i) => `invoke ${i.src}`),
        ...inPlace.map((t) => `${transitionText(t)}${t.actions.length > 0 ? ` / ${t.actions.join(', ')}` : ''}`),
        ...(s.exit.length > 0 ? [`exit / ${s.exit.join(', ')}`] : []),
      ];
      // With descriptions, mermaid shows the first one as the title unless the state is named.
      if (notes.length > 0 || s.mermaidId !== s.key) lines.push(`${indent}state "${mermaidText(s.key)}" as ${s.mermaidId}`);
      else lines.push(`${indent}${s.mermaidId}`);
      for (const note of notes) lines.push(`${indent}${s.mermaidId} : ${mermaidText(note)}`);
      if (s.type === 'final') lines.push(`${indent}${s.mermaidId} --> [*]`);
    });
  };
  declare(chart.states, chart.initial, '  ', false);

  // One edge per pair of states, its label listing every transition between them: several
  // failure events into `failed` would otherwise draw as a fan of overlapping arrows.
  const edges = new Map<string, { from: string; to: string; labels: string[] }>();
  for (const t of chart.transitions) {
    if (t.targets.length === 0) continue;
    // The root has no box: its transitions apply in every top-level state that is not final.
    const sources = t.source === chart.id ? chart.states.filter((s) => s.type !== 'final') : [byId.get(t.source)!];
    for (const source of sources) {
      for (const target of t.targets) {
        const to = byId.get(target)!.mermaidId;
        const key = `${source.mermaidId}\u0000${to}`;
        const edge = edges.get(key) ?? { from: source.mermaidId, to, labels: [] };
        edge.labels.push(mermaidText(transitionText(t)));
        edges.set(key, edge);
      }
    }
  }
  for (const e of edges.values()) lines.push(`  ${e.from} --> ${e.to} : ${e.labels.join('<br/>')}`);
  return `${lines.join('\n')}\n`;
}

export function machineToMermaid(machine: AnyStateMachine): string {
  return chartToMermaid(machineToChart(machine));
}
