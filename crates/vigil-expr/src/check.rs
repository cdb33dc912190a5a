//! The checks `cel` does not do: nesting before parsing, then over the parsed tree names, types,
//! depth and an estimated cost.

use cel::common::ast::{EntryExpr, Expr, IdedExpr, LiteralValue, operators};

use crate::limits::{COLLECTION_SIZE_BOUND, MAX_AST_DEPTH, MAX_COST};

/// Why a source or its tree is refused, before the caller adds the field and the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The tree is deeper than [`MAX_AST_DEPTH`].
    Depth,
    /// An identifier that is neither a root nor a comprehension's variable.
    UnknownVariable(String),
    /// A function or macro outside the allow-list, or called with the wrong arity.
    UnknownFunction(String),
    /// A field, operand or result of the wrong type.
    Type(String),
    /// The estimate is over [`MAX_COST`].
    Cost(u64),
}

/// How deep brackets (`(`, `[`, `{`) nest, and how many `?` there are, outside string literals.
///
/// `cel`'s ANTLR parser spends a large stack frame on each level of these (a 2 MiB thread
/// overflows at 16 nested parentheses in a debug build), and a stack overflow aborts the process,
/// so they are bounded before the parser sees the source.
pub(crate) fn lexical_nesting(source: &str) -> usize {
    let bytes = source.as_bytes();
    let (mut depth, mut deepest, mut questions) = (0usize, 0usize, 0usize);
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'(' | b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            b'?' => questions += 1,
            quote @ (b'\'' | b'"') => {
                let raw = i > 0 && matches!(bytes[i - 1], b'r' | b'R');
                let triple = bytes.get(i + 1) == Some(&quote) && bytes.get(i + 2) == Some(&quote);
                let closing_len = if triple { 3 } else { 1 };
                i += closing_len;
                while i < bytes.len() {
                    if bytes[i] == b'\\' && !raw {
                        i += 2;
                        continue;
                    }
                    if bytes[i] == quote
                        && (!triple || (bytes.get(i + 1) == Some(&quote) && bytes.get(i + 2) == Some(&quote)))
                    {
                        i += closing_len - 1;
                        break;
                    }
                    i += 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    deepest.max(questions)
}

/// The static type of a sub-expression, as far as the checker can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ty {
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Null,
    List(Box<Ty>),
    Map(Box<Ty>, Box<Ty>),
    Object(Object),
    /// Not known until run time: anything goes, and the run time decides.
    Dyn,
}

/// The records the bindings hold, with their fields (see `bindings.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Object {
    Node,
    Machine,
    Taint,
    Condition,
}

impl Object {
    fn field(self, name: &str) -> Option<Ty> {
        let strings = || Ty::Map(Box::new(Ty::String), Box::new(Ty::String));
        Some(match (self, name) {
            (Object::Node | Object::Machine, "name") => Ty::String,
            (Object::Node | Object::Machine, "labels" | "annotations") => strings(),
            (Object::Node, "taints") => Ty::List(Box::new(Ty::Object(Object::Taint))),
            (Object::Node, "unschedulable") => Ty::Bool,
            (Object::Node, "conditions") => Ty::Map(Box::new(Ty::String), Box::new(Ty::Object(Object::Condition))),
            (Object::Machine, "phase") => Ty::String,
            (Object::Machine, "deleting") => Ty::Bool,
            (Object::Taint, "key" | "value" | "effect") => Ty::String,
            (Object::Condition, "status" | "reason" | "message") => Ty::String,
            _ => return None,
        })
    }

    fn fields(self) -> &'static str {
        match self {
            Object::Node => "name, labels, annotations, taints, unschedulable, conditions",
            Object::Machine => "name, labels, annotations, phase, deleting",
            Object::Taint => "key, value, effect",
            Object::Condition => "status, reason, message",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Object::Node => "node",
            Object::Machine => "machine",
            Object::Taint => "a taint",
            Object::Condition => "a condition",
        }
    }
}

impl Ty {
    fn describe(&self) -> String {
        match self {
            Ty::Bool => "bool".into(),
            Ty::Int => "int".into(),
            Ty::Uint => "uint".into(),
            Ty::Double => "double".into(),
            Ty::String => "string".into(),
            Ty::Bytes => "bytes".into(),
            Ty::Null => "null".into(),
            Ty::List(_) => "list".into(),
            Ty::Map(_, _) => "map".into(),
            Ty::Object(o) => o.name().into(),
            Ty::Dyn => "dyn".into(),
        }
    }

    fn is(&self, other: &Ty) -> bool {
        self == &Ty::Dyn || self == other
    }

    fn is_numeric(&self) -> bool {
        matches!(self, Ty::Int | Ty::Uint | Ty::Double)
    }

    /// The type of an element when iterated: a list's items, a map's keys.
    fn element(&self) -> Option<Ty> {
        match self {
            Ty::List(e) => Some((**e).clone()),
            Ty::Map(k, _) => Some((**k).clone()),
            Ty::Object(_) => Some(Ty::String),
            Ty::Dyn => Some(Ty::Dyn),
            _ => None,
        }
    }

    /// Whether a value of this type may be a list or a map (whose size then matters).
    fn may_be_collection(&self) -> bool {
        matches!(self, Ty::List(_) | Ty::Map(_, _) | Ty::Object(_) | Ty::Dyn)
    }

    fn join(a: Ty, b: Ty) -> Ty {
        if a == b { a } else { Ty::Dyn }
    }
}

/// What the checker learns of a sub-expression.
#[derive(Debug, Clone)]
struct Facts {
    ty: Ty,
    /// Estimated steps to evaluate it.
    cost: u64,
    /// A bound on its size if it is a list or map.
    size: u64,
    /// A bound on the sizes of the lists or maps it holds.
    element_size: u64,
}

impl Facts {
    /// One step; sized as a binding's collection when it may be a collection.
    fn leaf(ty: Ty) -> Self {
        let bound = COLLECTION_SIZE_BOUND;
        let size = if ty.may_be_collection() { bound } else { 0 };
        Self { ty, cost: 1, size, element_size: bound }
    }
}

/// What a checked tree tells the evaluator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Checked {
    /// The estimated cost.
    pub cost: u64,
    /// Whether it reads `machine`.
    pub reads_machine: bool,
    /// Whether it iterates over a collection (so the size bound matters at run time).
    pub iterates: bool,
    /// The fields of `node` it reads, when it reads them only as `node.<field>` (`None`: it uses
    /// `node` whole, so every field is bound).
    pub node_fields: Option<NodeFields>,
}

/// The fields of `node` an expression reads: only these are built for each target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct NodeFields(u8);

impl NodeFields {
    /// Every field of `node` the checker knows, in the order of [`NodeFields::bit`].
    pub(crate) const NAMES: [&'static str; 6] =
        ["name", "labels", "annotations", "taints", "unschedulable", "conditions"];

    /// All fields.
    pub(crate) const ALL: NodeFields = NodeFields(0b11_1111);

    fn bit(field: &str) -> Option<u8> {
        Self::NAMES.iter().position(|n| *n == field).map(|i| 1 << i)
    }

    fn add(&mut self, field: &str) {
        // A field the checker does not know is refused by `select_field`; all are kept then.
        self.0 |= Self::bit(field).unwrap_or(Self::ALL.0);
    }

    /// The fields either reads.
    pub(crate) fn union(self, other: NodeFields) -> NodeFields {
        NodeFields(self.0 | other.0)
    }

    /// Whether `field` is read.
    pub(crate) fn has(self, field: &str) -> bool {
        Self::bit(field).is_some_and(|b| self.0 & b != 0)
    }
}

/// Checks a parsed tree: names, types, depth and estimated cost.
pub(crate) fn check(root: &IdedExpr) -> Result<Checked, Refusal> {
    let mut checker = Checker {
        scope: Vec::new(),
        reads_machine: false,
        iterates: false,
        node_fields: NodeFields::default(),
        node_whole: false,
    };
    let facts = checker.expr(root, 0)?;
    if !facts.ty.is(&Ty::Bool) {
        return Err(Refusal::Type(format!("it evaluates to a {}, not a bool", facts.ty.describe())));
    }
    if facts.cost > MAX_COST {
        return Err(Refusal::Cost(facts.cost));
    }
    let node_fields = (!checker.node_whole).then_some(checker.node_fields);
    Ok(Checked { cost: facts.cost, reads_machine: checker.reads_machine, iterates: checker.iterates, node_fields })
}

struct Checker {
    /// Comprehension variables in scope, innermost last.
    scope: Vec<(String, Facts)>,
    reads_machine: bool,
    iterates: bool,
    /// The fields read as `node.<field>`.
    node_fields: NodeFields,
    /// Whether `node` is read otherwise (whole).
    node_whole: bool,
}

fn add(a: u64, b: u64) -> u64 {
    a.saturating_add(b)
}

impl Checker {
    fn expr(&mut self, e: &IdedExpr, depth: usize) -> Result<Facts, Refusal> {
        if depth > MAX_AST_DEPTH {
            return Err(Refusal::Depth);
        }
        let depth = depth + 1;
        match &e.expr {
            Expr::Unspecified => Err(Refusal::Type("an empty expression".into())),
            Expr::Literal(l) => Ok(Facts::leaf(match l {
                LiteralValue::Boolean(_) => Ty::Bool,
                LiteralValue::Bytes(_) => Ty::Bytes,
                LiteralValue::Double(_) => Ty::Double,
                LiteralValue::Int(_) => Ty::Int,
                LiteralValue::Null => Ty::Null,
                LiteralValue::String(_) => Ty::String,
                LiteralValue::UInt(_) => Ty::Uint,
            })),
            Expr::Ident(name) => self.ident(name),
            Expr::Select(select) => {
                let operand = match &select.operand.expr {
                    // `node.<field>` of the binding (not of a comprehension variable named
                    // `node`): only that field is read.
                    Expr::Ident(name) if name == "node" && !self.scope.iter().any(|(n, _)| n == "node") => {
                        if depth > MAX_AST_DEPTH {
                            return Err(Refusal::Depth);
                        }
                        self.node_fields.add(&select.field);
                        Facts::leaf(Ty::Object(Object::Node))
                    }
                    _ => self.expr(&select.operand, depth)?,
                };
                let ty = if select.test { Ty::Bool } else { select_field(&operand.ty, &select.field)? };
                if select.test {
                    select_field(&operand.ty, &select.field)?;
                }
                let size = if ty.may_be_collection() { operand.element_size } else { 0 };
                Ok(Facts { ty, cost: add(operand.cost, 1), size, element_size: COLLECTION_SIZE_BOUND })
            }
            Expr::List(list) => {
                let mut facts = Facts::leaf(Ty::Dyn);
                let mut element: Option<Ty> = None;
                facts.size = list.elements.len() as u64;
                facts.element_size = 0;
                for item in &list.elements {
                    let f = self.expr(item, depth)?;
                    facts.cost = add(facts.cost, f.cost);
                    facts.element_size = facts.element_size.max(f.size);
                    element = Some(match element {
                        None => f.ty,
                        Some(t) => Ty::join(t, f.ty),
                    });
                }
                facts.ty = Ty::List(Box::new(element.unwrap_or(Ty::Dyn)));
                Ok(facts)
            }
            Expr::Map(map) => {
                let mut facts = Facts::leaf(Ty::Map(Box::new(Ty::Dyn), Box::new(Ty::Dyn)));
                facts.size = map.entries.len() as u64;
                facts.element_size = 0;
                for entry in &map.entries {
                    let EntryExpr::MapEntry(entry) = &entry.expr else {
                        return Err(Refusal::Type("a message field in a map literal".into()));
                    };
                    let k = self.expr(&entry.key, depth)?;
                    let v = self.expr(&entry.value, depth)?;
                    facts.cost = add(facts.cost, add(k.cost, v.cost));
                    facts.element_size = facts.element_size.max(k.size).max(v.size);
                }
                Ok(facts)
            }
            Expr::Struct(s) => Err(Refusal::Type(format!(
                "it builds a message ({}), and expressions here read a node or a machine only",
                s.type_name
            ))),
            Expr::Comprehension(c) => {
                self.iterates = true;
                let range = self.expr(&c.iter_range, depth)?;
                let Some(element) = range.ty.element() else {
                    return Err(Refusal::Type(format!(
                        "it iterates over a {}, which is not a list or a map",
                        range.ty.describe()
                    )));
                };
                let init = self.expr(&c.accu_init, depth)?;
                let mut var = Facts::leaf(element);
                var.size = range.element_size;
                let mut pushed = 1;
                self.scope.push((c.iter_var.clone(), var));
                if let Some(second) = &c.iter_var2 {
                    self.scope.push((second.clone(), Facts::leaf(Ty::Dyn)));
                    pushed += 1;
                }
                self.scope.push((c.accu_var.clone(), init.clone()));
                pushed += 1;
                let body = (|| {
                    let cond = self.expr(&c.loop_cond, depth)?;
                    let step = self.expr(&c.loop_step, depth)?;
                    let result = self.expr(&c.result, depth)?;
                    Ok::<_, Refusal>((cond, step, result))
                })();
                self.scope.truncate(self.scope.len() - pushed);
                let (cond, step, result) = body?;
                let per_item = add(cond.cost, step.cost);
                Ok(Facts {
                    ty: result.ty,
                    cost: add(add(range.cost, init.cost), add(range.size.saturating_mul(per_item), result.cost)),
                    size: range.size,
                    element_size: step.size.max(range.element_size),
                })
            }
            Expr::Call(call) => {
                let arity = call.args.len() + usize::from(call.target.is_some());
                if !allowed(&call.func_name, call.target.is_some(), arity) {
                    return Err(Refusal::UnknownFunction(shown_function(
                        &call.func_name,
                        call.target.is_some(),
                        arity,
                    )));
                }
                let mut args = Vec::with_capacity(call.args.len() + 1);
                if let Some(target) = &call.target {
                    args.push(self.expr(target, depth)?);
                }
                for a in &call.args {
                    args.push(self.expr(a, depth)?);
                }
                let cost = args.iter().fold(1u64, |c, a| add(c, a.cost));
                let (ty, size, extra) = call_type(&call.func_name, call.target.is_some(), &args)?;
                let size = if ty.may_be_collection() { size } else { 0 };
                Ok(Facts {
                    ty,
                    cost: add(cost, extra),
                    size,
                    element_size: args.iter().map(|a| a.element_size).max().unwrap_or(COLLECTION_SIZE_BOUND),
                })
            }
        }
    }

    fn ident(&mut self, name: &str) -> Result<Facts, Refusal> {
        if let Some((_, facts)) = self.scope.iter().rev().find(|(n, _)| n == name) {
            let mut facts = facts.clone();
            facts.cost = 1;
            return Ok(facts);
        }
        match name {
            "node" => {
                self.node_whole = true;
                Ok(Facts::leaf(Ty::Object(Object::Node)))
            }
            "machine" => {
                self.reads_machine = true;
                Ok(Facts::leaf(Ty::Object(Object::Machine)))
            }
            _ => Err(Refusal::UnknownVariable(name.to_owned())),
        }
    }
}

fn select_field(operand: &Ty, field: &str) -> Result<Ty, Refusal> {
    match operand {
        Ty::Object(o) => o
            .field(field)
            .ok_or_else(|| Refusal::Type(format!("{} has no field {field:?} (it has {})", o.name(), o.fields()))),
        Ty::Map(k, v) if k.is(&Ty::String) => Ok((**v).clone()),
        Ty::Dyn => Ok(Ty::Dyn),
        other => Err(Refusal::Type(format!("it selects field {field:?} of a {}", other.describe()))),
    }
}

/// The result type of a call, the size of its result when a collection, and any cost beyond
/// one step plus its arguments' (a scan of a collection).
fn call_type(name: &str, has_target: bool, args: &[Facts]) -> Result<(Ty, u64, u64), Refusal> {
    let bound = COLLECTION_SIZE_BOUND;
    let arity = |n: usize| -> Result<(), Refusal> {
        if args.len() == n { Ok(()) } else { Err(Refusal::UnknownFunction(format!("{name}/{}", args.len()))) }
    };
    let want = |i: usize, ty: &Ty, what: &str| -> Result<(), Refusal> {
        match args.get(i) {
            Some(a) if a.ty.is(ty) || (ty == &Ty::Double && a.ty.is_numeric()) => Ok(()),
            Some(a) => Err(Refusal::Type(format!("{what} takes a {}, not a {}", ty.describe(), a.ty.describe()))),
            None => Err(Refusal::UnknownFunction(format!("{name}/{}", args.len()))),
        }
    };
    let ty_of = |i: usize| args.get(i).map(|a| a.ty.clone()).unwrap_or(Ty::Dyn);
    Ok(match name {
        operators::LOGICAL_AND | operators::LOGICAL_OR => {
            arity(2)?;
            let op = if name == operators::LOGICAL_AND { "&&" } else { "||" };
            want(0, &Ty::Bool, op)?;
            want(1, &Ty::Bool, op)?;
            (Ty::Bool, bound, 0)
        }
        operators::LOGICAL_NOT => {
            arity(1)?;
            want(0, &Ty::Bool, "!")?;
            (Ty::Bool, bound, 0)
        }
        operators::NOT_STRICTLY_FALSE => {
            arity(1)?;
            (Ty::Bool, bound, 0)
        }
        operators::EQUALS | operators::NOT_EQUALS => {
            arity(2)?;
            let scan = args.iter().map(|a| a.size).max().unwrap_or(0);
            (Ty::Bool, 0, scan)
        }
        operators::LESS | operators::LESS_EQUALS | operators::GREATER | operators::GREATER_EQUALS => {
            arity(2)?;
            let (a, b) = (ty_of(0), ty_of(1));
            let comparable = a == Ty::Dyn
                || b == Ty::Dyn
                || (a.is_numeric() && b.is_numeric())
                || (a == b && matches!(a, Ty::String | Ty::Bytes | Ty::Bool));
            if !comparable {
                return Err(Refusal::Type(format!("it orders a {} against a {}", a.describe(), b.describe())));
            }
            (Ty::Bool, bound, 0)
        }
        operators::ADD => {
            arity(2)?;
            let (a, b) = (ty_of(0), ty_of(1));
            let size = add(args[0].size, args[1].size);
            let ty = match (&a, &b) {
                (Ty::Dyn, _) | (_, Ty::Dyn) => Ty::Dyn,
                (Ty::List(x), Ty::List(y)) => Ty::List(Box::new(Ty::join((**x).clone(), (**y).clone()))),
                _ if a == b && (matches!(a, Ty::String | Ty::Bytes) || a.is_numeric()) => a,
                _ => {
                    return Err(Refusal::Type(format!("it adds a {} and a {}", a.describe(), b.describe())));
                }
            };
            let extra = if matches!(ty, Ty::List(_) | Ty::Dyn) { size } else { 0 };
            (ty, size, extra)
        }
        operators::SUBSTRACT | operators::MULTIPLY | operators::DIVIDE | operators::MODULO => {
            arity(2)?;
            let (a, b) = (ty_of(0), ty_of(1));
            let ty = match (&a, &b) {
                (Ty::Dyn, _) | (_, Ty::Dyn) => Ty::Dyn,
                _ if a.is_numeric() && a == b => a,
                _ => {
                    return Err(Refusal::Type(format!("arithmetic on a {} and a {}", a.describe(), b.describe())));
                }
            };
            (ty, bound, 0)
        }
        operators::NEGATE => {
            arity(1)?;
            let a = ty_of(0);
            if !(a == Ty::Dyn || matches!(a, Ty::Int | Ty::Double)) {
                return Err(Refusal::Type(format!("it negates a {}", a.describe())));
            }
            (a, bound, 0)
        }
        operators::CONDITIONAL => {
            arity(3)?;
            want(0, &Ty::Bool, "a condition")?;
            let size = args[1].size.max(args[2].size);
            (Ty::join(ty_of(1), ty_of(2)), size, 0)
        }
        operators::INDEX => {
            arity(2)?;
            let ty = match ty_of(0) {
                Ty::List(e) => {
                    want(1, &Ty::Int, "a list index")?;
                    *e
                }
                Ty::Map(_, v) => *v,
                Ty::Object(_) => {
                    want(1, &Ty::String, "a field index")?;
                    Ty::Dyn
                }
                Ty::Dyn => Ty::Dyn,
                other => {
                    return Err(Refusal::Type(format!("it indexes a {}", other.describe())));
                }
            };
            (ty, args[0].element_size, 0)
        }
        operators::IN => {
            arity(2)?;
            match ty_of(1) {
                Ty::List(_) | Ty::Map(_, _) | Ty::Dyn => {}
                other => {
                    return Err(Refusal::Type(format!("`in` looks into a {}, not a list or a map", other.describe())));
                }
            }
            (Ty::Bool, bound, args[1].size)
        }
        "size" => {
            arity(1)?;
            match ty_of(0) {
                Ty::String | Ty::Bytes | Ty::List(_) | Ty::Map(_, _) | Ty::Dyn => {}
                other => {
                    return Err(Refusal::Type(format!("size() of a {}", other.describe())));
                }
            }
            (Ty::Int, bound, 0)
        }
        "contains" | "startsWith" | "endsWith" if has_target => {
            arity(2)?;
            want(0, &Ty::String, name)?;
            want(1, &Ty::String, name)?;
            (Ty::Bool, bound, 0)
        }
        "int" | "uint" | "double" | "string" if !has_target => {
            arity(1)?;
            let ty = match name {
                "int" => Ty::Int,
                "uint" => Ty::Uint,
                "double" => Ty::Double,
                _ => Ty::String,
            };
            (ty, bound, 0)
        }
        _ => {
            return Err(Refusal::UnknownFunction(shown_function(name, has_target, args.len())));
        }
    })
}

/// Whether a call is on the allow-list: its name, whether it is a method, and its arity counting
/// the target. The macros (`has`, `all`, `exists`, `exists_one`, `map`, `filter`) are expanded by
/// the parser, so one still called here was called with the wrong arity.
fn allowed(name: &str, has_target: bool, arity: usize) -> bool {
    match name {
        operators::LOGICAL_NOT | operators::NOT_STRICTLY_FALSE | operators::NEGATE => !has_target && arity == 1,
        operators::LOGICAL_AND
        | operators::LOGICAL_OR
        | operators::EQUALS
        | operators::NOT_EQUALS
        | operators::LESS
        | operators::LESS_EQUALS
        | operators::GREATER
        | operators::GREATER_EQUALS
        | operators::ADD
        | operators::SUBSTRACT
        | operators::MULTIPLY
        | operators::DIVIDE
        | operators::MODULO
        | operators::INDEX
        | operators::IN => !has_target && arity == 2,
        operators::CONDITIONAL => !has_target && arity == 3,
        "size" => arity == 1,
        "contains" | "startsWith" | "endsWith" => has_target && arity == 2,
        "int" | "uint" | "double" | "string" => !has_target && arity == 1,
        _ => false,
    }
}

/// A function as a refusal names it: `name/arity`, or `.name/arity` for a method (arity without
/// the target).
fn shown_function(name: &str, has_target: bool, arity: usize) -> String {
    if has_target { format!(".{name}/{}", arity.saturating_sub(1)) } else { format!("{name}/{arity}") }
}
