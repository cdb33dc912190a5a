//! CEL expressions as health-check rules: a rule reads a Node (and, for a MachineHealthCheck, its
//! Machine) and says whether the target is unhealthy.
//!
//! Built on the `cel` crate, which parses and evaluates but has neither a type checker nor a cost
//! limit, and whose parser can overflow the stack on nested brackets. So [`Expression::compile`]
//! bounds the source's length and nesting before parsing (on a thread of its own with a large
//! stack), then checks the tree itself: only `node` and `machine` as roots, an allow-list of
//! functions and macros, the fields and types of the bindings, the tree's depth, and a static
//! cost estimate. [`Expression::evaluate`] never answers true on an error: it answers
//! [`Outcome::Unknown`]. A check's expressions share one [`Prepared`] target, built once with the
//! fields any of them reads ([`Reads`]).

mod bindings;
mod check;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, LazyLock};

use cel::common::ast::IdedExpr;
use cel::common::value::Val;
use cel::{Context, Env, Value};

pub use bindings::{Bindings, Condition, MachineFacts, NodeFacts, Taint};
use check::Refusal;

/// The bounds an expression is held to, public so that docs, CRD validation and tests can cite them.
pub mod limits {
    /// The longest source accepted, in bytes.
    pub const MAX_SOURCE_BYTES: usize = 4096;
    /// The deepest nesting of brackets, and the most `?` conditionals, accepted in a source.
    pub const MAX_NESTING: usize = 12;
    /// The deepest parsed tree accepted (`a + b + …` of n terms is n deep; `&&` and `||` chains
    /// are balanced by the parser). `cel` evaluates recursively, about 35 KiB of stack a level in
    /// a debug build: 24 levels fit in half of a 2 MiB thread (a Tokio worker's default).
    pub const MAX_AST_DEPTH: usize = 24;
    /// The size assumed of any list or map a binding holds (labels, annotations, taints,
    /// conditions) when estimating cost; a target over it evaluates to unknown for an
    /// expression that iterates.
    pub const COLLECTION_SIZE_BOUND: u64 = 256;
    /// The highest estimated cost accepted: one step per node of the tree, a comprehension's body
    /// counted once per item of its range. One comprehension over a binding's collection fits
    /// with a body of up to ~390 steps; two nested over two bindings' collections do not.
    pub const MAX_COST: u64 = 100_000;
}

/// The stack of the thread that parses: ample for [`limits::MAX_NESTING`] in a debug build.
const PARSE_STACK_BYTES: usize = 64 << 20;

/// Why a source was refused; each message names the field and the value it was given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExprError {
    /// The source is longer than [`limits::MAX_SOURCE_BYTES`].
    #[error("{field}: {} is {len} bytes long, over the limit of {limit}", shown(.value))]
    TooLong {
        /// The field the source came from.
        field: String,
        /// The source.
        value: String,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The source nests deeper than [`limits::MAX_NESTING`] or [`limits::MAX_AST_DEPTH`].
    #[error("{field}: {} nests too deeply: {detail}", shown(.value))]
    TooDeep {
        /// The field the source came from.
        field: String,
        /// The source.
        value: String,
        /// Which bound, and by how much.
        detail: String,
    },
    /// The source is not valid CEL.
    #[error("{field}: {} does not compile: {reason}", shown(.value))]
    Syntax {
        /// The field the source came from.
        field: String,
        /// The source.
        value: String,
        /// The parser's first complaint, with its position.
        reason: String,
    },
    /// The source names a variable other than `node`, `machine` or a comprehension's own.
    #[error(
        "{field}: {} does not type-check: unknown variable {name:?} (only `node` and `machine` are defined)",
        shown(.value)
    )]
    UnknownVariable {
        /// The field the source came from.
        field: String,
        /// The source.
        value: String,
        /// The unknown variable.
        name: String,
    },
    /// The source calls a function or macro outside the allow-list, or with the wrong arity.
    #[error(
        "{field}: {} does not type-check: unknown function {name} (allowed: size, contains, startsWith, endsWith, int, uint, double, string, has, all, exists, exists_one, map, filter, and the operators)",
        shown(.value)
    )]
    UnknownFunction {
        /// The field the source came from.
        field: String,
        /// The source.
        value: String,
        /// The function, as `name/arity` (`.name/arity` for a method).
        name: String,
    },
    /// The source reads a field that does not exist, mixes types, or is not a bool.
    #[error("{field}: {} does not type-check: {reason}", shown(.value))]
    Type {
        /// The field the source came from.
        field: String,
        /// The source.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// The source's estimated cost is over [`limits::MAX_COST`].
    #[error(
        "{field}: {} costs an estimated {cost} steps, over the limit of {limit} (each list or map of a node counted as {bound} items)",
        shown(.value)
    )]
    TooCostly {
        /// The field the source came from.
        field: String,
        /// The source.
        value: String,
        /// The estimate.
        cost: u64,
        /// The limit.
        limit: u64,
        /// The size assumed of a binding's collection.
        bound: u64,
    },
}

impl ExprError {
    /// The field the refused source came from, for callers that build their own message.
    pub fn field(&self) -> &str {
        match self {
            ExprError::TooLong { field, .. }
            | ExprError::TooDeep { field, .. }
            | ExprError::Syntax { field, .. }
            | ExprError::UnknownVariable { field, .. }
            | ExprError::UnknownFunction { field, .. }
            | ExprError::Type { field, .. }
            | ExprError::TooCostly { field, .. } => field,
        }
    }

    /// The source that was refused, for callers that report field and value apart.
    pub fn value(&self) -> &str {
        match self {
            ExprError::TooLong { value, .. }
            | ExprError::TooDeep { value, .. }
            | ExprError::Syntax { value, .. }
            | ExprError::UnknownVariable { value, .. }
            | ExprError::UnknownFunction { value, .. }
            | ExprError::Type { value, .. }
            | ExprError::TooCostly { value, .. } => value,
        }
    }

    /// Why it was refused, without the field and the value: for callers (the policy validator)
    /// whose own message already names both.
    pub fn reason(&self) -> String {
        let full = self.to_string();
        let head = format!("{}: {} ", self.field(), shown(self.value()));
        full.strip_prefix(&head).map_or_else(|| full.clone(), str::to_owned)
    }
}

/// The value as a message shows it: quoted and escaped, and cut when long.
fn shown(value: &str) -> String {
    const SHOWN_CHARS: usize = 120;
    if value.chars().count() <= SHOWN_CHARS {
        format!("{value:?}")
    } else {
        let head: String = value.chars().take(SHOWN_CHARS).collect();
        format!("{head:?}…")
    }
}

/// The result of evaluating an expression for one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The expression holds.
    True,
    /// The expression does not hold.
    False,
    /// The expression could not be decided for this target, and why: never counted as true.
    Unknown(String),
}

/// A compiled, checked expression, ready to evaluate against many targets.
#[derive(Debug, Clone)]
pub struct Expression {
    source: String,
    tree: Arc<IdedExpr>,
    cost: u64,
    reads_machine: bool,
    iterates: bool,
    /// The fields of `node` to bind for it (the others are never read).
    node_fields: check::NodeFields,
}

/// Two expressions are equal when compiled from the same source: compiling is deterministic, so
/// a policy holding one compares by what the operator wrote.
impl PartialEq for Expression {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Eq for Expression {}

/// The standard library, built once: the functions the allow-list lets through are in it.
static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| Arc::new(Env::stdlib()));

impl Expression {
    /// Parses and checks `source`, the value of `field`, refusing it with an error naming both.
    pub fn compile(field: &str, source: &str) -> Result<Expression, ExprError> {
        let err_field = || field.to_owned();
        let err_value = || source.to_owned();
        if source.len() > limits::MAX_SOURCE_BYTES {
            return Err(ExprError::TooLong {
                field: err_field(),
                value: err_value(),
                len: source.len(),
                limit: limits::MAX_SOURCE_BYTES,
            });
        }
        let nesting = check::lexical_nesting(source);
        if nesting > limits::MAX_NESTING {
            return Err(ExprError::TooDeep {
                field: err_field(),
                value: err_value(),
                detail: format!("brackets or conditionals {nesting} deep, over the limit of {}", limits::MAX_NESTING),
            });
        }
        let tree =
            parse(source).map_err(|reason| ExprError::Syntax { field: err_field(), value: err_value(), reason })?;
        let checked = check::check(&tree).map_err(|refusal| match refusal {
            Refusal::Depth => ExprError::TooDeep {
                field: err_field(),
                value: err_value(),
                detail: format!("its parsed tree is over {} levels deep", limits::MAX_AST_DEPTH),
            },
            Refusal::UnknownVariable(name) => {
                ExprError::UnknownVariable { field: err_field(), value: err_value(), name }
            }
            Refusal::UnknownFunction(name) => {
                ExprError::UnknownFunction { field: err_field(), value: err_value(), name }
            }
            Refusal::Type(reason) => ExprError::Type { field: err_field(), value: err_value(), reason },
            Refusal::Cost(cost) => ExprError::TooCostly {
                field: err_field(),
                value: err_value(),
                cost,
                limit: limits::MAX_COST,
                bound: limits::COLLECTION_SIZE_BOUND,
            },
        })?;
        Ok(Expression {
            source: source.to_owned(),
            tree: Arc::new(tree),
            cost: checked.cost,
            reads_machine: checked.reads_machine,
            iterates: checked.iterates,
            node_fields: checked.node_fields.unwrap_or(check::NodeFields::ALL),
        })
    }

    /// The source it was compiled from, for messages and status.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The static cost estimate it passed, for reports and tests.
    pub fn estimated_cost(&self) -> u64 {
        self.cost
    }

    /// Whether it reads `machine`, so a caller knows it needs a Machine to decide.
    pub fn reads_machine(&self) -> bool {
        self.reads_machine
    }

    /// Evaluates it for one target: true or false, or unknown (with why) on any run-time error.
    /// Several expressions judged for the same target share one [`Prepared`] instead.
    pub fn evaluate(&self, bindings: &Bindings) -> Outcome {
        self.evaluate_prepared(&Prepared::new(bindings, Reads::of([self])))
    }

    /// [`Expression::evaluate`] against a target prepared once for every expression that reads it
    /// (`target` must have been prepared with reads covering this expression's).
    pub fn evaluate_prepared(&self, target: &Prepared<'_>) -> Outcome {
        if self.reads_machine && !target.has_machine {
            return Outcome::Unknown("the expression reads `machine`, and this target has no Machine".into());
        }
        if self.iterates && target.largest as u64 > limits::COLLECTION_SIZE_BOUND {
            return Outcome::Unknown(format!(
                "the target has a list or map of {} items, over the {} its cost limit assumes",
                target.largest,
                limits::COLLECTION_SIZE_BOUND
            ));
        }
        let context = match &target.context {
            Ok(context) => context,
            Err(why) => return Outcome::Unknown(why.clone()),
        };
        // `cel` has panicking paths (unwrap, unreachable) that its tests do not show unreachable:
        // a panic is caught and reported as unknown rather than taking the checker down.
        catch_unwind(AssertUnwindSafe(|| match Value::resolve(&self.tree, context) {
            Ok(Value::Bool(true)) => Outcome::True,
            Ok(Value::Bool(false)) => Outcome::False,
            Ok(other) => Outcome::Unknown(format!("the expression evaluated to a {}, not a bool", other.type_of())),
            Err(e) => Outcome::Unknown(e.to_string()),
        }))
        .unwrap_or_else(|_| Outcome::Unknown("the CEL evaluator panicked on this target".into()))
    }
}

/// What a set of expressions reads of a target: the fields of `node`, and whether `machine`.
/// A caller builds only these facts, and a [`Prepared`] binds only these.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reads {
    node_fields: check::NodeFields,
    machine: bool,
}

impl Reads {
    /// What any of `expressions` reads.
    pub fn of<'e>(expressions: impl IntoIterator<Item = &'e Expression>) -> Reads {
        expressions.into_iter().fold(Reads::default(), |r, e| Reads {
            node_fields: r.node_fields.union(e.node_fields),
            machine: r.machine || e.reads_machine,
        })
    }

    /// Whether field `name` of `node` (`labels`, `annotations`, `taints`, `unschedulable`,
    /// `conditions`, `name`) is read.
    pub fn node_field(&self, name: &str) -> bool {
        self.node_fields.has(name)
    }

    /// Whether `machine` is read.
    pub fn machine(&self) -> bool {
        self.machine
    }
}

/// One target ready for every expression of a check: its values built once, with only the fields
/// some expression reads, bound in one context the expressions are resolved against in turn.
pub struct Prepared<'v> {
    /// The context, or why the target's values could not be bound.
    context: Result<Context<'v, 'v>, String>,
    /// The largest list or map among the bindings (the cost limit's size bound must cover it).
    largest: usize,
    has_machine: bool,
}

impl Prepared<'_> {
    /// Binds `bindings` for expressions that read `reads`.
    pub fn new(bindings: &Bindings, reads: Reads) -> Self {
        let mut context = Context::with_env(Arc::clone(&ENV));
        let mut variables = vec![("node", bindings::node_value(&bindings.node, reads.node_fields))];
        if let Some(machine) = bindings.machine.as_ref().filter(|_| reads.machine) {
            variables.push(("machine", bindings::machine_value(machine)));
        }
        let mut bound = Ok(());
        for (name, value) in variables {
            match Box::<dyn Val>::try_from(value) {
                Ok(value) => context.add_variable_as_val(name, value),
                Err(e) => bound = Err(format!("binding `{name}`: {e}")),
            }
        }
        Prepared {
            context: bound.map(|()| context),
            largest: bindings.largest_collection(),
            has_machine: bindings.machine.is_some(),
        }
    }
}

/// Parses on a thread with a large stack, returning the parser's first error as one line.
fn parse(source: &str) -> Result<IdedExpr, String> {
    let owned = source.to_owned();
    let handle = std::thread::Builder::new()
        .name("vigil-expr-parse".into())
        .stack_size(PARSE_STACK_BYTES)
        .spawn(move || {
            ENV.parser().parse(&owned).map_err(|errors| {
                errors
                    .errors
                    .first()
                    .map(|e| {
                        let (line, column) = e.pos;
                        format!("line {line}, column {}: {}", column + 1, e.msg)
                    })
                    .unwrap_or_else(|| "the parser failed without saying why".into())
            })
        })
        .map_err(|e| format!("the parser could not start: {e}"))?;
    handle.join().unwrap_or_else(|_| Err("the parser panicked".into()))
}
