// The EPL language: models, parallel blocks, policies and training jobs (docs/language.md).
grammar Epl;

// file : item* EOF
file : item* EOF ;

item
    : importDecl
    | letDecl
    | defDecl
    | modelDecl
    | policyDecl
    | trainDecl
    ;

importDecl : IMPORT STRING ;

letDecl : LET binding (',' binding)* ;
binding : ID '=' expr ;

defDecl   : DEF ID '(' params? ')' ('->' type)? block ;
modelDecl : MODEL ID '(' params? ')' block ;
params    : param (',' param)* ;
param     : ID ':' type ('=' expr)? ;

type
    : DTYPE '[' dimList? ']'      # tensorType
    | ID                          # scalarType
    ;
dimList : expr (',' expr)* ;

block : '{' stmt* '}' ;

stmt
    : targets '=' expr            # assignStmt
    | parallelBlock               # parallelStmt
    | RETURN expr (',' expr)*     # returnStmt
    ;
targets : ID (',' ID)* ;

// repeat(k) replicate { … } repeats a whole stage k times (k pipeline stages).
parallelBlock : (REPEAT '(' expr ')')? kind=(REPLICATE | SPLIT) ('(' width ')')? block ;
width : AUTO | expr ;

expr
    : '-' expr                                  # negExpr
    | expr op=('*' | '/' | '//' | '%') expr     # mulExpr
    | expr op=('+' | '-') expr                  # addExpr
    | REPEAT '(' expr ')' call                  # repeatExpr
    | call                                      # callExpr
    | '(' expr ')'                              # parenExpr
    | '{' (setting ','?)* '}'                   # recordExpr
    | '[' (expr (',' expr)*)? ']'               # listExpr
    | literal                                   # literalExpr
    | ID                                        # nameExpr
    ;
call : ID '(' (arg (',' arg)*)? ')' ;
arg  : (ID '=')? expr ;

literal : INT | FLOAT | SIZE | STRING | WORD | DTYPE | TRUE | FALSE | AUTO | NONE ;

policyDecl : POLICY '{' setting* '}' ;
trainDecl  : TRAIN ID '{' setting* '}' ;
setting    : ID '=' expr ;

IMPORT    : 'import' ;
LET       : 'let' ;
DEF       : 'def' ;
MODEL     : 'model' ;
RETURN    : 'return' ;
REPLICATE : 'replicate' ;
SPLIT     : 'split' ;
REPEAT    : 'repeat' ;
AUTO      : 'auto' ;
POLICY    : 'policy' ;
TRAIN     : 'train' ;
TRUE      : 'true' ;
FALSE     : 'false' ;
NONE      : 'none' ;
DTYPE     : 'f32' | 'f16' | 'bf16' | 'i32' | 'i64' ;

// Sizes carry a unit: 25MB, 80GiB.
SIZE   : [0-9]+ ('.' [0-9]+)? ('KB' | 'MB' | 'GB' | 'TB' | 'KiB' | 'MiB' | 'GiB' | 'TiB') ;
FLOAT  : [0-9]+ '.' [0-9]+ EXPONENT? | [0-9]+ EXPONENT ;
INT    : [0-9]+ ;
// A word that starts with a digit, for option values such as 1f1b.
WORD   : [0-9]+ [a-zA-Z_] [a-zA-Z0-9_]* ;
ID     : [a-zA-Z_] [a-zA-Z0-9_]* ;
STRING : '"' (~["\\\r\n] | '\\' .)* '"' ;
// A string with no closing quote on its line; the parser reports it.
UNTERMINATED_STRING : '"' (~["\\\r\n] | '\\' .)* ;
fragment EXPONENT : [eE] [+-]? [0-9]+ ;

COMMENT : '#' ~[\r\n]* -> skip ;
WS      : [ \t\r\n]+ -> skip ;
// Anything else is one bad character, reported by the parser with its location.
BAD_CHAR : . ;
