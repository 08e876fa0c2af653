// Draws an XState machine from its own definition (machine.root), so the chart can never
// drift from the code: states, initial states, transitions with their events and guards,
// handlers that act in place, entry/exit actions, invoked actors, final states and parallel
// regions (drawn as mermaid's concurrent regions). Two forms:
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
  /** parallel: the root's states are regions that are all active at once. */
  type: 'compound' | 'parallel';
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
  const type = root.type === 'parallel' ? 'parallel' : 'compound';
  return { id: root.id, type, ...(root.initial === undefined ? {} : { initial: root.initial }), states: root.states, transitions };
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

/** The notes drawn under a state: its actions, actors and the transitions it takes in place. */
function stateNotes(chart: MachineChart, s: ChartState): string[] {
  const inPlace = chart.transitions.filter((t) => t.source === s.id && t.targets.length === 0);
  return [
    ...(s.entry.length > 0 ? [`entry / ${s.entry.join(', ')}`] : []),
    ...s.invoke.map((i) => `invoke ${i.src}`),
    ...inPlace.map((t) => `${transitionText(t)}${t.actions.length > 0 ? ` / ${t.actions.join(', ')}` : ''}`),
    ...(s.exit.length > 0 ? [`exit / ${s.exit.join(', ')}`] : []),
  ];
}

/**
 * Mermaid stateDiagram-v2 text of a chart. The regions of a parallel state are mermaid's
 * concurrent regions (`--` between them) inside the state's box; a parallel root gets a box named
 * after the machine, since mermaid separates regions only inside a composite state. A compound
 * region is drawn as its states alone, its name (and notes) on its initial arrow: mermaid 11
 * fails to lay out an edge to or from a composite state nested in a region's own box. Its
 * transitions are drawn from each of its states that is not final, and those into it end at its
 * initial state.
 */
export function chartToMermaid(chart: MachineChart): string {
  const byId = new Map(chartStates(chart).map((s) => [s.id, s]));
  const lines = ['stateDiagram-v2'];
  const rootBox = chart.type === 'parallel' ? mermaidStateId([chart.id]) : undefined;
  /** Regions drawn as their states alone. */
  const unboxed = new Set<string>();

  const declare = (states: ChartState[], indent: string, regions: boolean): void => {
    states.forEach((s, i) => {
      if (regions && i > 0) lines.push(`${indent}--`);
      if (regions && s.type === 'compound') {
        unboxed.add(s.id);
        const label = [s.key, ...stateNotes(chart, s)].map(mermaidText).join('<br/>');
        lines.push(`${indent}[*] --> ${byId.get(s.initial!)!.mermaidId} : ${label}`);
        declare(s.states, indent, false);
        return;
      }
      if (s.states.length > 0) {
        lines.push(`${indent}state "${mermaidText(s.key)}" as ${s.mermaidId} {`);
        if (s.initial !== undefined) lines.push(`${indent}  [*] --> ${byId.get(s.initial)!.mermaidId}`);
        declare(s.states, `${indent}  `, s.type === 'parallel');
        lines.push(`${indent}}`);
        return;
      }
      const notes = stateNotes(chart, s);
      // With descriptions, mermaid shows the first one as the title unless the state is named.
      if (notes.length > 0 || s.mermaidId !== s.key) lines.push(`${indent}state "${mermaidText(s.key)}" as ${s.mermaidId}`);
      else lines.push(`${indent}${s.mermaidId}`);
      for (const note of notes) lines.push(`${indent}${s.mermaidId} : ${mermaidText(note)}`);
      if (s.type === 'final') lines.push(`${indent}${s.mermaidId} --> [*]`);
    });
  };
  if (rootBox === undefined) {
    if (chart.initial !== undefined) lines.push(`  [*] --> ${byId.get(chart.initial)!.mermaidId}`);
    declare(chart.states, '  ', false);
  } else {
    lines.push(`  state "${mermaidText(chart.id)}" as ${rootBox} {`);
    declare(chart.states, '    ', true);
    lines.push('  }');
  }

  /** Where a transition of `id` is drawn from: a compound root has no box, nor has an unboxed region, so each of their states that is not final. */
  const drawnFrom = (id: string): string[] => {
    if (id === chart.id && rootBox !== undefined) return [rootBox];
    const children = id === chart.id ? chart.states : unboxed.has(id) ? byId.get(id)!.states : undefined;
    return children ? children.filter((s) => s.type !== 'final').map((s) => s.mermaidId) : [byId.get(id)!.mermaidId];
  };
  const drawnTo = (id: string): string => {
    const s = byId.get(id)!;
    return unboxed.has(id) ? byId.get(s.initial!)!.mermaidId : s.mermaidId;
  };
  // One edge per pair of states, its label listing every transition between them: several
  // failure events into `failed` would otherwise draw as a fan of overlapping arrows.
  const edges = new Map<string, { from: string; to: string; labels: string[] }>();
  for (const t of chart.transitions) {
    for (const from of t.targets.length > 0 ? drawnFrom(t.source) : []) {
      for (const target of t.targets) {
        const to = drawnTo(target);
        const key = `${from}\u0000${to}`;
        const edge = edges.get(key) ?? { from, to, labels: [] };
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
